//! Configuration: the YAML file (`file`), its units (`units`), validation (`build`) and the
//! typed result (`model`, and the client identity in `identity`); `wording` puts the deserializer's messages in an operator's
//! words. Only this module and the binary know about files and flags.

mod build;
mod file;
mod identity;
pub mod libpq;
mod limits;
mod load;
mod model;
mod policy;
mod print;
mod table;
pub mod units;
mod wording;

pub(crate) use build::HOP_BY_HOP;
pub use build::{Overrides, UNNAMED_TOKEN};
pub use identity::*;
pub use load::{ConfigError, load, load_store, load_str, parse_file};
pub use model::*;
pub use policy::*;
pub use table::{Lookup, RouteTable};
