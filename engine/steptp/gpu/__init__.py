"""Build here, run there: GPU packs (:mod:`steptp.gpu.pack`), their runtime-only runner (:mod:`steptp.gpu.run`) and the merge of GPU results into a dataset (:mod:`steptp.gpu.merge`)."""
