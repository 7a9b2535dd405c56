"""What every kernel family shares: the online-softmax step, tile helpers, replayed launches."""
