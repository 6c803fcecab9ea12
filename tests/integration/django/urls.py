from django.urls import path

from tests.integration.django.shop import views

urlpatterns = [
    path("orders/", views.place_order),
    path("runs/<str:run_id>/cancel/", views.cancel_run),
    path("gates/<str:tag>/", views.open_gate),
]
