"""The consumer's side of the API: @subscriber, Message, backoff policies."""
