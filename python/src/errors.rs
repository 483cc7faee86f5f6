//! The exceptions of the package and the one mapping of the SDK's errors to them.
//!
//! Every exception is a `modelshare.Error`; each carries the SDK error's message and a `code`
//! attribute: the gRPC status code's name (`"NOT_FOUND"`, `"UNAUTHENTICATED"`, ...) when the
//! server refused the call, else `None`.

use modelshare_worker::WorkerError;
use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use tonic::Code;

create_exception!(
    modelshare,
    Error,
    PyException,
    "Base class of every modelshare error. `code` is the gRPC status code's name when the server refused the call, else None."
);
create_exception!(
    modelshare,
    ConnectError,
    Error,
    "The server could not be reached (a bad address, nothing listening, a TLS failure)."
);
create_exception!(
    modelshare,
    CredentialsError,
    Error,
    "A token or TLS setting is unusable (an unreadable token file, a malformed token); the file is named, the token never."
);
create_exception!(
    modelshare,
    Unauthenticated,
    Error,
    "The server refused the token (UNAUTHENTICATED)."
);
create_exception!(
    modelshare,
    PermissionDenied,
    Error,
    "The caller may not do this (PERMISSION_DENIED)."
);
create_exception!(
    modelshare,
    NotFound,
    Error,
    "No such model, version or tensor (NOT_FOUND)."
);
create_exception!(
    modelshare,
    Unavailable,
    Error,
    "The server cannot take the call now (UNAVAILABLE, RESOURCE_EXHAUSTED): retrying later may pass."
);
create_exception!(
    modelshare,
    SessionEnded,
    Error,
    "The session has ended or is reconnecting."
);
create_exception!(
    modelshare,
    ProtocolError,
    Error,
    "The server broke the protocol, or speaks a version this package does not."
);
create_exception!(
    modelshare,
    DeviceError,
    Error,
    "Mapping or reading the arena failed, or the operation needs memory of another kind (host or device)."
);
create_exception!(
    modelshare,
    DtypeError,
    Error,
    "The tensor's dtype cannot be given as asked (bf16 or f8 in numpy without ml_dtypes, a dtype the consumer lacks)."
);
create_exception!(
    modelshare,
    ChecksumError,
    Error,
    "A tensor's bytes do not match the checksum of the manifest."
);
create_exception!(
    modelshare,
    Timeout,
    Error,
    "A call did not finish within the timeout given."
);

/// The Python exception for `e`, with its `code` attribute set.
pub(crate) fn from_worker(py: Python<'_>, e: &WorkerError) -> PyErr {
    let (err, code) = match e {
        WorkerError::Rpc { call, status } | WorkerError::Refused { call, status, .. } => {
            let code = status.code();
            let message = match e {
                WorkerError::Refused { .. } => modelshare_worker::report(e),
                _ => format!("{call}: {} ({})", status.message(), code_name(code)),
            };
            let err = match code {
                Code::Unauthenticated => Unauthenticated::new_err(message),
                Code::PermissionDenied => PermissionDenied::new_err(message),
                Code::NotFound => NotFound::new_err(message),
                Code::Unavailable | Code::ResourceExhausted => Unavailable::new_err(message),
                Code::DeadlineExceeded => Timeout::new_err(message),
                Code::Ok
                | Code::Cancelled
                | Code::Unknown
                | Code::InvalidArgument
                | Code::AlreadyExists
                | Code::FailedPrecondition
                | Code::Aborted
                | Code::OutOfRange
                | Code::Unimplemented
                | Code::Internal
                | Code::DataLoss => Error::new_err(message),
            };
            (err, Some(code_name(code)))
        }
        other => {
            let message = modelshare_worker::report(other);
            let err = match other {
                WorkerError::BadAddress { .. }
                | WorkerError::Connect { .. }
                | WorkerError::Discover(_) => ConnectError::new_err(message),
                WorkerError::Credentials { .. } => CredentialsError::new_err(message),
                WorkerError::Protocol(_) | WorkerError::ProtocolVersion(_) => {
                    ProtocolError::new_err(message)
                }
                WorkerError::Device { .. } => DeviceError::new_err(message),
                WorkerError::NoSuchTensor { .. } => NotFound::new_err(message),
                WorkerError::WrongDtype { .. } => DtypeError::new_err(message),
                WorkerError::SessionEnded => SessionEnded::new_err(message),
                WorkerError::Rpc { .. }
                | WorkerError::Refused { .. }
                | WorkerError::BadServeOptions(_)
                | WorkerError::WrongSession { .. }
                | WorkerError::ModelGone { .. }
                | WorkerError::Unservable { .. } => Error::new_err(message),
            };
            (err, None)
        }
    };
    // Setting an attribute on a fresh exception instance cannot fail in practice; if it did,
    // the exception would still be raised, without `code`.
    let _ = err.value(py).setattr("code", code);
    err
}

/// The canonical name of a gRPC status code, as `grpc.StatusCode` spells it.
fn code_name(code: Code) -> &'static str {
    modelshare_proto::codes::name(code as i32)
}
