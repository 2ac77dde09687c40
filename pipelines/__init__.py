"""Ray Data pipelines: StackExchangeQA construction, tokenisation, and the schemas of what they write."""
