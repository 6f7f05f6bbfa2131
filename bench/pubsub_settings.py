"""The portal's settings with Channels' Redis pub/sub layer instead of the list-based one: for
`python -m bench.websockets --layer pubsub`, which shows what the fan-out costs (bench only)."""

from portal.settings import *  # noqa: F403
from portal.settings import REDIS_URL

CHANNEL_LAYERS = {
    "default": {
        "BACKEND": "channels_redis.pubsub.RedisPubSubChannelLayer",
        "CONFIG": {"hosts": [REDIS_URL]},
    }
}
