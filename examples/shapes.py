"""A module of the example job's own, beside it: workers import it by name, as they would yours."""


def area(side: float) -> float:
    return side * side
