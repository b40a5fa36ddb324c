"""mine: lift production GPU kernels out of running inference engines and compile them into kern manifests.

The package `mine` is only the command line; the stages live in the top-level packages
`capture` -> `mining` -> `generators` -> `manifests`, and a stage never imports a later one.
"""

__version__ = "0.1.0"
