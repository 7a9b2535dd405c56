"""sm90 (Hopper) kernels in Gluon: warp-specialized, TMA and wgmma."""
