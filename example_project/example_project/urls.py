from django.contrib import admin
from django.urls import path
from shop import views

urlpatterns = [
    path("admin/", admin.site.urls),
    path("orders/", views.place, name="place-order"),
    path("orders/<int:pk>/", views.detail, name="order"),
]
