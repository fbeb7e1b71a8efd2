"""Backend views, each built from the token store by one module: `hf` (Arrow, for torch / NxD /
ColossalAI) and `litgpt` (PackedDataset .bin files, for the SageMaker marketplace algorithm)."""

FORMATS = ("hf", "litgpt")
