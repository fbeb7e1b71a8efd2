"""llmpipe: raw text -> token store -> packed views -> train -> Hugging Face export -> evaluation."""

__version__ = "0.1.0"
