"""Engines: the computations backends are made of, kept out of flatcheck.backends so that it
holds backends only.

- quadform: vᵀHv by forward tangents against first-order adjoints (a traced loss graph)
- ggn_trace: the exact (or class-sampled) GGN trace and its three per-sample strategies
- persample: per-sample squared gradient norms from layer inputs and output gradients
- pullback: a block of VJPs by plain reverse mode
- state, kept: per-batch state kept across products, and when it goes stale
"""
