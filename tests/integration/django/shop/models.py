from django.db import models


class Order(models.Model):
    tag = models.CharField(max_length=64)
    total = models.IntegerField()
    status = models.CharField(max_length=16, default="new")

    class Meta:
        app_label = "shop"
