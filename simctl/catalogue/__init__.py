"""Published shapes and specs: models (dense and MoE) and accelerators."""
