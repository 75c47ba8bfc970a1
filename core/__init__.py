"""abwatch's shared words: what builders, runners and the service all name the same way.

The bottom of the layers (``service`` -> ``runners`` -> ``builders`` -> ``core``): a module
here imports nothing of abwatch, so any layer can use it and none drags another in. One
concept a module: the errors every layer raises (:mod:`.errors`), a commit as abwatch
records it (:mod:`.commit_info`), what every config model builds on (:mod:`.config_base`),
the metrics' names (:mod:`.metric_names`), credentials masked (:mod:`.redact`), JSON from
outside checked (:mod:`.safejson`), the two sides of a comparison (:mod:`.sides`), the file
lock (:mod:`.file_lock`), a device's identity (:mod:`.device_identity`), the registry every
kind of plug-in is found and validated through (:mod:`.plugins`) and TVM's device APIs by
name (:mod:`.device_backends`).

Importing this package loads none of its modules: each is imported by its own name.
"""
