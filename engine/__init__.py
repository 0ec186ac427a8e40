"""convalue engine: configuration, data, gradients, projection, store, Gram, selection, fine-tune, reports, driver."""
