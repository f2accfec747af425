"""A task file (SkyPilot's YAML) read and checked, every problem reported at once:
:mod:`~skyward.launch.taskfile.file` (reading, pipelines), :mod:`~skyward.launch.taskfile.schema`
(the pydantic model), :mod:`~skyward.launch.taskfile.fields` and
:mod:`~skyward.launch.taskfile.resources` (what each field accepts),
:mod:`~skyward.launch.taskfile.mounts` and :mod:`~skyward.launch.taskfile.stores` (file mounts and
buckets), :mod:`~skyward.launch.taskfile.check` (the error that gathers the problems).

Nothing here runs anything or imports the pool.
"""
