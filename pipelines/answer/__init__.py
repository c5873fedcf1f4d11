"""The answer side: a question over stored records in, a cited answer out.

query, figures (analyse the question) → retrieval (+ memory_fts) (rank passages) → prompt
(what the model reads) → quote_constraint (constrained decoding) → qa (answer, parse and
verify citations: citations, support) → conflicts; mapreduce and summarize for more text
than one context holds.
"""
