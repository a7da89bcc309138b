//! The composition root: a proxy and what runs beside it — the admin listener and the
//! background loops — started in one place, for the binary (`idemproxy serve`) and the
//! test harness alike, so that a proxy under test is put together as a deployed one is.
//! Serving requests stays the caller's: the binary runs a server thread per core, the
//! tests one server on one runtime.

mod open;

pub use open::{OpenError, agree_later, apply_migrations, open_store};

use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::background::Background;
use crate::proxy::Proxy;
use crate::store::Store;

/// A proxy with its admin listener and background loops running.
pub struct App<S> {
    proxy: Proxy<S>,
    admin: JoinHandle<()>,
    stop_admin: oneshot::Sender<()>,
    background: Background,
}

impl<S: Store + Clone> App<S> {
    /// Serves the admin API on `admin_listener` and starts the background loops that
    /// `proxy`'s configuration asks for.
    pub fn start(proxy: Proxy<S>, admin_listener: TcpListener) -> Self {
        let (stop_admin, stopped) = oneshot::channel::<()>();
        let admin = tokio::spawn(crate::admin::run(
            admin_listener,
            proxy.clone(),
            crate::admin::Tokens::from_config(proxy.config()),
            async move {
                let _ = stopped.await;
            },
        ));
        let background = Background::start(&proxy);
        App {
            proxy,
            admin,
            stop_admin,
            background,
        }
    }

    /// The proxy, to serve requests with.
    pub fn proxy(&self) -> &Proxy<S> {
        &self.proxy
    }

    /// Stops the background loops and the admin listener (once the server has drained:
    /// readiness and metrics stay up until then), and waits for the listener to close.
    pub async fn stop(self) {
        self.background.stop();
        let _ = self.stop_admin.send(());
        let _ = self.admin.await;
    }
}
