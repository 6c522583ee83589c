"""A module that exists on the client's (and scheduler's) path but not on the worker's."""


def double(x):
    return 2 * x
