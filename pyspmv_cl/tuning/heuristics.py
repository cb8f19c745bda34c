"""The format choice for ``format="auto"`` until the measuring tuner lands: a rule
over the mean row length and the device type (Bell & Garland: the scalar kernel for
short rows, the vector kernel once rows fill a SIMD group)."""


def choose_format(features, profile, dtype):
    """Return (format name, explanation)."""
    mean = features.mean_row_length
    if profile.is_cpu:
        return ("csr-scalar",
                "CPU device: one work-item streaming each row avoids barrier costs")
    lanes = profile.lanes(dtype)
    if mean >= max(4.0, lanes / 4):
        return ("csr-vector",
                f"mean row length {mean:.1f} fills a group of work-items per row")
    return ("csr-scalar", f"mean row length {mean:.1f} is short: one work-item per row")
