"""The command line: the light parser (:mod:`.main`), each command's work (:mod:`.commands`),
terminal output (:mod:`.report`) and the demo repository (:mod:`.demo`).
"""
