"""The bare DRF create endpoint that bench.api_submit compares job submission with: a model of the
same shape, a ModelSerializer and a CreateAPIView, with the portal's settings, authentication and
middleware. Mounted only by this package's settings and URLs, never by the product."""
