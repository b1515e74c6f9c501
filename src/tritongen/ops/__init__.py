"""Ops: attention over the paged KV cache, norms, rotary. `reference` is the pure-PyTorch oracle;
`attention` holds the metadata type and the dispatch that fast kernels plug into."""
