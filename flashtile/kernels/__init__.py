"""The kernels by family: common/ (what all share), portable/ (Triton: any CUDA GPU, the interpreter), hopper/
(Gluon: sm90). Each algorithm lives in its own file; they share the online-softmax step."""
