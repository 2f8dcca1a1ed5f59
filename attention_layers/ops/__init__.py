"""The kernels below the layers: private, no stable API.

Each evaluation of an attention (direct, fused, tiled, Pallas; the additive
score's blocks and fused piece) lives here, with the one function that picks
among them by backend, device and dtype (`attention.dot_product_attention`,
`additive_score.additive_scores`) and the device query they ask
(`devices.platform`). Layers call those functions and never ask the device
themselves. Each kernel is tested alone against the direct formula
(tests/test_kernels.py).
"""
