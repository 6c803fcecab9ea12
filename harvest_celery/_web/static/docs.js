// Starts Swagger UI (served from the package) on the API's OpenAPI document. "Try it out" sends
// the console session's CSRF token, which a mutation made with the session cookie needs.
(function () {
  "use strict";
  var node = document.getElementById("swagger-ui");
  var csrf = node.getAttribute("data-csrf");
  window.ui = SwaggerUIBundle({
    url: node.getAttribute("data-openapi"),
    dom_id: "#swagger-ui",
    deepLinking: true,
    requestInterceptor: function (request) {
      if (csrf) { request.headers["X-CSRF-Token"] = csrf; }
      return request;
    }
  });
})();
