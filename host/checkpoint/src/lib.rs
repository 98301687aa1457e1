//! Epoch checkpoint protocol, manifests, storage SPI (placeholder until the checkpoint issue).
