"""The bottom layer every stage shares: the dump's binary records, the analysis schema, the
manifest vocabulary (wire names and sizes, expressions, serialisation), the capture tables, the errors.

Why a package of its own: the schema version, the dtype table, the parameter-type grammar, the
expression evaluator and the manifest's byte form were each written down in several stages
(the verifier, both generators, the kernel table, the mining fits) and could drift apart. Here
each is stated once. This package imports only the standard library and no stage of the
project, so capture, mining, generators and manifests may all import it (`binfmt` needs numpy).

Modules: `wire` (schema version, dtypes and their sizes, enumerations, the param-type grammar),
`expr` (the closed expression set: its tree, JSON and text forms, and the one evaluator),
`dumps` (the one canonical manifest serialisation), `errors` (`MineError`, the base of every error
a user can cause, and the error classes several stages share), `capture_tables` (the capture
library's callback, API, attribute and meta-key tables), `binfmt` (the dump's binary launch
records: scan, decode, rewrite as JSON; `python -m vocab.binfmt`), `analysis` (the analysis
contract every stage after mining reads).
"""
