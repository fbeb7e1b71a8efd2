"""Data stages: read documents, shard, tokenize, token store, packed views."""
