"""A CPU tensor's values for fajit.Program.evaluate without numpy (the GPU machine's Python may
lack it): an array.array of its elements as a memoryview of its shape."""
import array


def host_buffer(t):
    flat = array.array("f" if t.is_floating_point() else "i", t.reshape(-1).tolist())
    return memoryview(flat).cast("B").cast(flat.typecode, tuple(t.shape))
