from django.contrib import admin

admin.site.site_header = "FabricPool administration"
admin.site.site_title = "FabricPool admin"
admin.site.index_title = "Inventory, users and schedules"
admin.site.site_url = "/"
