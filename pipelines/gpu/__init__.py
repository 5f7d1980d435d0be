"""The accelerator job's library side: the job's entry script (:mod:`~pipelines.gpu.bootstrap`,
standard library only: hashes, parts, unpacking) and the hardware figures every GPU report
carries (:mod:`~pipelines.gpu.hardware`: device, versions, MFU). Packing and importing live in
:mod:`catalog.gpu_job`, the node's runner in :mod:`flows.gpu`."""
