//! The one place where domain errors become gRPC status codes.

use tonic::{Code, Status};

use crate::error::ServerError;
use crate::tenants::error::TenantsFileError;
use crate::weights::error::WeightsError;

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
                WeightsError::Io { .. } => Code::Internal,
            },
            ServerError::ModelNotFound(_)
            | ServerError::VersionNotFound { .. }
            | ServerError::SessionNotFound(_)
            | ServerError::LeaseNotFound(_)
            | ServerError::NotLeased { .. } => Code::NotFound,
            ServerError::NoReadyVersion(_) | ServerError::WrongState { .. } => {
                Code::FailedPrecondition
            }
            ServerError::LimitExceeded { .. } => Code::ResourceExhausted,
            ServerError::Device(d) if d.is_resource_exhausted() => Code::ResourceExhausted,
            ServerError::Device(_) => Code::Internal,
            ServerError::LoadCancelled { .. } => Code::Aborted,
            ServerError::ShuttingDown | ServerError::Starting | ServerError::Allocating { .. } => {
                Code::Unavailable
            }
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
