"""A stateless asyncio gateway for RocketMQ 5 with pop-with-notify long polling."""
