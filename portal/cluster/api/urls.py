from rest_framework.routers import SimpleRouter

from portal.cluster.api import views

router = SimpleRouter()
router.register("flavors", views.FlavorViewSet, basename="flavor")
router.register("priority-classes", views.PriorityClassViewSet, basename="priorityclass")
router.register("virtual-clusters", views.VirtualClusterViewSet, basename="virtualcluster")
router.register("nodes", views.NodeViewSet, basename="node")

urlpatterns = router.urls
