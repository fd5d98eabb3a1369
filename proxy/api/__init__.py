"""The client-facing ``apache.rocketmq.v2.MessagingService`` (gRPC)."""
