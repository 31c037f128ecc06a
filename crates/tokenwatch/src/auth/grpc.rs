// The gRPC side of authentication: a tonic interceptor on the OTLP/gRPC services that needs an
// `ingest` token and answers UNAUTHENTICATED / PERMISSION_DENIED before the message is decoded.

use super::{AuthHandle, Listener, Role};
use tonic::{Request, Status};

/// Checks the `authorization` metadata of every call (passes everything without tokens).
#[derive(Clone)]
pub struct IngestInterceptor(pub AuthHandle);

impl tonic::service::Interceptor for IngestInterceptor {
    fn call(&mut self, request: Request<()>) -> Result<Request<()>, Status> {
        let value = request
            .metadata()
            .get("authorization")
            .map(|v| v.as_bytes());
        match self.0.check(value, Role::Ingest, Listener::Otlp) {
            Ok(()) => Ok(request),
            Err(d) if d.is_forbidden() => Err(Status::permission_denied(d.message("OTLP export"))),
            Err(d) => Err(Status::unauthenticated(d.message("OTLP export"))),
        }
    }
}

impl AuthHandle {
    /// The interceptor for the OTLP/gRPC services.
    pub fn grpc_interceptor(&self) -> IngestInterceptor {
        IngestInterceptor(self.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::{TokenSet, handle_for};
    use tonic::service::Interceptor;

    #[test]
    fn codes_follow_the_token() {
        let set = TokenSet::parse(
            "ingest ingest-0123456789abcdef\nread read-0123456789abcdef\n",
            "t",
        )
        .unwrap();
        let mut i = handle_for(set, std::path::Path::new("t")).grpc_interceptor();
        let call = |i: &mut IngestInterceptor, v: Option<&str>| {
            let mut r = Request::new(());
            if let Some(v) = v {
                r.metadata_mut().insert("authorization", v.parse().unwrap());
            }
            i.call(r)
                .map(|_| ())
                .map_err(|s| (s.code(), s.message().to_string()))
        };
        let (code, msg) = call(&mut i, None).unwrap_err();
        assert_eq!(code, tonic::Code::Unauthenticated);
        assert!(msg.contains("needs an `ingest` token"), "{msg}");
        assert_eq!(
            call(&mut i, Some("Bearer other-0123456789abcdef"))
                .unwrap_err()
                .0,
            tonic::Code::Unauthenticated
        );
        assert_eq!(
            call(&mut i, Some("Bearer read-0123456789abcdef"))
                .unwrap_err()
                .0,
            tonic::Code::PermissionDenied
        );
        assert_eq!(call(&mut i, Some("Bearer ingest-0123456789abcdef")), Ok(()));
        assert_eq!(
            call(&mut AuthHandle::default().grpc_interceptor(), None),
            Ok(())
        );
    }
}
