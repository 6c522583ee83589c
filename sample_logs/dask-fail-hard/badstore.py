"""A worker whose data store raises when a result named 'poison' is deleted (a broken custom ``data=`` store).

Dask stores a result inside a try (a failure there becomes the task's error), but deletes a released key inside
its state machine, where an exception makes the worker fail hard."""
from distributed import Worker


class BadStore(dict):
    def __delitem__(self, key):
        if "poison" in str(key):
            raise OSError(5, "Input/output error (the custom store could not delete this result)")
        super().__delitem__(key)


class BadStoreWorker(Worker):
    def __init__(self, *args, **kwargs):
        kwargs["data"] = BadStore()
        super().__init__(*args, **kwargs)
