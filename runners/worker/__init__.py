"""The TVM worker's side: modules that run inside a build's own Python, never in abwatch's.

``tvm_worker.py`` is run as a file by the build's interpreter (``runners/worker_process.py``,
``WORKER``) and loads the other modules here by path (``_sibling``): TVM, numpy and the
standard library only, never abwatch, which lives in another environment. abwatch's host
side never imports this package; it names its files (``runners/worker_process.py``, ``WORKER_DIR``).
This file is empty of code so that nothing here runs in abwatch's process.
"""
