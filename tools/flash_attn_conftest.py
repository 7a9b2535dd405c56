"""The conftest under which flash-attn's own tests/test_flash_attn.py runs, unchanged, against flashtile (issue 39's
bar): ``import flash_attn`` gives flashtile's functions (flashtile.integrations.flash_attn). gpu_session.sh's
flash-attn-tests step copies it beside that file."""
import flashtile.integrations.flash_attn as shim

shim.install()
