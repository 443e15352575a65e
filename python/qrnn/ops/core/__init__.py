"""What every op family shares: ``dispatch`` (when an eager call may skip the dispatcher, the
autograd and vmap helpers, per-device registration), ``registry`` (the native kernels per
device type, the ops' schemas from the C++ manifests), ``kernel_args`` (argument builders
generated from ``_C.kernel_fields()``), ``outputs`` (allocation), ``checks`` (argument
checks), ``cuda`` (streams, devices, launches) and ``sharding`` (DTensor rules). Nothing here
imports a family."""
