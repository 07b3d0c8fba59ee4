"""Exceptions for the library's status codes.

BEAM_ERR_INVALID_ARGUMENT (a broken rule of the contract) becomes a
ValueError carrying the library's own message (function, argument, rule).
Every other failure is a BeamError (a RuntimeError) with the status code in
``.status``; subclasses name the kinds an engine may want to catch.
"""


class BeamError(RuntimeError):
    """A failed libbeammoe call that is not an argument error."""

    def __init__(self, message, status):
        super().__init__(message)
        self.status = status


class BeamUnsupportedError(BeamError):
    """BEAM_ERR_UNSUPPORTED: not available in this build or backend."""


class BeamDeviceError(BeamError):
    """BEAM_ERR_DEVICE: a CUDA runtime or driver error."""


class BeamCommError(BeamError):
    """BEAM_ERR_COMM: a communication error or a peer's timeout."""


class BeamOutOfMemoryError(BeamError):
    """BEAM_ERR_OUT_OF_MEMORY."""


class BeamArgumentError(ValueError):
    """BEAM_ERR_INVALID_ARGUMENT, with the library's message."""

    status = 1


_BY_STATUS = {
    2: BeamUnsupportedError,
    3: BeamDeviceError,
    4: BeamCommError,
    5: BeamOutOfMemoryError,
}


def raise_for_status(status, message):
    if status == 1:
        raise BeamArgumentError(message)
    raise _BY_STATUS.get(status, BeamError)(message, status)
