//! The one place where domain errors become gRPC status codes.

use tonic::{Code, Status};

use modelshare_core::error::TenantsFileError;
use modelshare_core::error::{CoreError, bounded_message};
use modelshare_core::weights::error::WeightsError;
use modelshare_serving::{InferError, Kind, StreamError};

/// The code of a failed read of a model file: the operator's files, not the caller's fault
/// and not the server's bug. A file the server may not read is FAILED_PRECONDITION (fix its
/// permissions), a file cut short under a load is DATA_LOSS, anything else INTERNAL.
fn io_code(kind: std::io::ErrorKind) -> Code {
    use std::io::ErrorKind as K;
    match kind {
        K::PermissionDenied | K::IsADirectory | K::NotADirectory => Code::FailedPrecondition,
        K::UnexpectedEof => Code::DataLoss,
        _ => Code::Internal,
    }
}

/// The status of a refusal or failure of the host: every [`CoreError`] has its code here, in one
/// exhaustive `match`; the message is cut at [`bounded_message`]'s length.
pub fn from_core(e: CoreError) -> Status {
    let code = match &e {
        CoreError::InvalidArgument { .. } | CoreError::InvalidName(_) => Code::InvalidArgument,
        CoreError::Weights(w) => match w {
            WeightsError::BadPath { .. }
            | WeightsError::Malformed { .. }
            | WeightsError::Limit { .. } => Code::InvalidArgument,
            WeightsError::NotFound { .. } => Code::NotFound,
            WeightsError::Io { source, .. } => io_code(source.kind()),
        },
        CoreError::ModelNotFound(_)
        | CoreError::VersionNotFound { .. }
        | CoreError::SessionNotFound(_)
        | CoreError::LeaseNotFound(_)
        | CoreError::NotLeased { .. } => Code::NotFound,
        CoreError::NoReadyVersion(_)
        | CoreError::WrongState { .. }
        | CoreError::FilesChanged { .. }
        | CoreError::SharedMemory(_)
        | CoreError::NotOnDevice(_) => Code::FailedPrecondition,
        CoreError::LimitExceeded { .. } | CoreError::NoRoom { .. } | CoreError::NoDeviceRoom(_) => {
            Code::ResourceExhausted
        }
        CoreError::Device(d) if d.is_resource_exhausted() => Code::ResourceExhausted,
        CoreError::Device(_) => Code::Internal,
        CoreError::LoadCancelled { .. } => Code::Aborted,
        CoreError::ShuttingDown
        | CoreError::Starting
        | CoreError::Allocating { .. }
        | CoreError::Replicating { .. }
        | CoreError::Restoring(_) => Code::Unavailable,
        CoreError::Unauthenticated(_) => Code::Unauthenticated,
        CoreError::PermissionDenied(_) => Code::PermissionDenied,
        CoreError::NameTaken(_) => Code::AlreadyExists,
        CoreError::QuotaExceeded { .. } => Code::ResourceExhausted,
        CoreError::UnknownTenant(_) => Code::InvalidArgument,
        CoreError::NoTenantsFile => Code::FailedPrecondition,
        CoreError::TenantsFile(TenantsFileError::Invalid { .. }) => Code::InvalidArgument,
        CoreError::TenantsFile(TenantsFileError::Read { .. }) => Code::FailedPrecondition,
        CoreError::Internal(_) => Code::Internal,
    };
    Status::new(code, bounded_message(e.to_string()))
}

/// The gRPC code of a request path's kind: the code of the same number.
pub fn code(kind: Kind) -> Code {
    Code::from_i32(kind.number())
}

/// The status of a request that got no answer.
pub fn from_infer(e: InferError) -> Status {
    Status::new(code(e.kind()), bounded_message(e.to_string()))
}

/// The status that ends a worker's Serve stream.
pub fn from_stream(e: StreamError) -> Status {
    Status::new(code(e.kind), bounded_message(e.message))
}

/// `?` on a domain result in a gRPC handler: the error becomes its status here.
pub trait OrStatus<T> {
    /// The result, its error mapped to a status.
    fn or_status(self) -> Result<T, Status>;
}

impl<T> OrStatus<T> for Result<T, CoreError> {
    fn or_status(self) -> Result<T, Status> {
        self.map_err(from_core)
    }
}

impl<T> OrStatus<T> for Result<T, InferError> {
    fn or_status(self) -> Result<T, Status> {
        self.map_err(from_infer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A model file the server may not read, or one cut short during a load, would be an
    /// INTERNAL error (a server bug) instead of the operator's problem, with its path.
    #[test]
    fn model_file_read_errors_have_their_own_codes_and_the_path() {
        for (kind, code) in [
            (
                std::io::ErrorKind::PermissionDenied,
                Code::FailedPrecondition,
            ),
            (std::io::ErrorKind::UnexpectedEof, Code::DataLoss),
            (std::io::ErrorKind::Other, Code::Internal),
        ] {
            let e = CoreError::Weights(WeightsError::io(
                "m/model.safetensors",
                std::io::Error::from(kind),
            ));
            let s = from_core(e);
            assert_eq!(s.code(), code, "{kind:?}");
            assert!(
                s.message().contains("m/model.safetensors"),
                "{}",
                s.message()
            );
        }
    }
}
