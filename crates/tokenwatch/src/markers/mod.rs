// Version and deploy markers (spec section 8): the detector that turns observed model/prompt
// versions into markers, the sink running it, and the before/after statistics (what a marker is:
// `kernel::markers`, shared with the sources that observe versions).

pub mod compare;
pub mod detect;
pub mod sink;
pub mod stats;

pub use crate::kernel::markers::{MarkerKind, MarkerSource, marker, new_marker_id};
pub use detect::VersionDetector;
pub use sink::MarkerSink;
