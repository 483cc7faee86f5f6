//! The one place where domain errors become gRPC status codes.

use tonic::{Code, Status};

use crate::error::ServerError;
use crate::tenants::error::TenantsFileError;
use crate::weights::error::WeightsError;

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

impl From<ServerError> for Status {
    fn from(e: ServerError) -> Self {
        let code = match &e {
            ServerError::InvalidArgument { .. } | ServerError::InvalidName(_) => {
                Code::InvalidArgument
            }
            ServerError::Weights(w) => match w {
                WeightsError::BadPath { .. }
                | WeightsError::Malformed { .. }
                | WeightsError::Limit { .. } => Code::InvalidArgument,
                WeightsError::NotFound { .. } => Code::NotFound,
                WeightsError::Io { source, .. } => io_code(source.kind()),
            },
            ServerError::ModelNotFound(_)
            | ServerError::VersionNotFound { .. }
            | ServerError::SessionNotFound(_)
            | ServerError::LeaseNotFound(_)
            | ServerError::NotLeased { .. } => Code::NotFound,
            ServerError::NoReadyVersion(_)
            | ServerError::WrongState { .. }
            | ServerError::FilesChanged { .. }
            | ServerError::NotOnDevice(_) => Code::FailedPrecondition,
            ServerError::LimitExceeded { .. }
            | ServerError::NoRoom { .. }
            | ServerError::NoDeviceRoom(_) => Code::ResourceExhausted,
            ServerError::Device(d) if d.is_resource_exhausted() => Code::ResourceExhausted,
            ServerError::Device(_) => Code::Internal,
            ServerError::LoadCancelled { .. } => Code::Aborted,
            ServerError::ShuttingDown
            | ServerError::Starting
            | ServerError::Allocating { .. }
            | ServerError::Replicating { .. }
            | ServerError::Restoring(_) => Code::Unavailable,
            ServerError::Unauthenticated(_) => Code::Unauthenticated,
            ServerError::PermissionDenied(_) => Code::PermissionDenied,
            ServerError::NameTaken(_) => Code::AlreadyExists,
            ServerError::QuotaExceeded { .. } => Code::ResourceExhausted,
            ServerError::UnknownTenant(_) => Code::InvalidArgument,
            ServerError::NoTenantsFile => Code::FailedPrecondition,
            ServerError::TenantsFile(TenantsFileError::Invalid { .. }) => Code::InvalidArgument,
            ServerError::TenantsFile(TenantsFileError::Read { .. }) => Code::FailedPrecondition,
            ServerError::Internal(_) => Code::Internal,
        };
        Status::new(code, crate::error::bounded_message(e.to_string()))
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
            let e = ServerError::Weights(WeightsError::io(
                "m/model.safetensors",
                std::io::Error::from(kind),
            ));
            let s = Status::from(e);
            assert_eq!(s.code(), code, "{kind:?}");
            assert!(
                s.message().contains("m/model.safetensors"),
                "{}",
                s.message()
            );
        }
    }
}
