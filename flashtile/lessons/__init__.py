"""The lessons' kernels, runnable: softmax three ways and FlashAttention-1. They share the production
kernels' online-softmax step, so the lesson and the product cannot drift apart. For teaching and for
comparison in the benchmark, not for speed."""
