//! `deploy/kubernetes/` read as the cluster would, and checked against the binary: every
//! idemproxy container's arguments parse, its configuration (from its ConfigMap, with its
//! Secret's environment) is accepted, and the manifests agree with it — ports, probe paths,
//! volume mounts, the store on a writable volume owned by the image's user, environment
//! from Secrets that exist, a grace period that covers the drain, Services and
//! PodDisruptionBudgets that select the pods.

use std::collections::HashMap;
use std::path::Path;

use serde_json::Value;

/// The image's user (distroless `nonroot`).
const IMAGE_UID: i64 = 65532;

fn manifests(file: &str) -> Vec<Value> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("deploy/kubernetes")
        .join(file);
    let text = std::fs::read_to_string(&path).unwrap();
    serde_saphyr::from_multiple::<Value>(&text)
        .unwrap()
        .into_iter()
        .filter(|d| !d.is_null())
        .collect()
}

fn named<'a>(docs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    docs.iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name}"))
}

fn port_of(addr: &std::net::SocketAddr) -> i64 {
    i64::from(addr.port())
}

/// A probe's or Service's port: a number, or the name of a container port.
fn resolve(port: &Value, ports: &HashMap<String, i64>) -> i64 {
    match port {
        Value::String(name) => *ports
            .get(name)
            .unwrap_or_else(|| panic!("no container port named {name}")),
        n => n.as_i64().unwrap(),
    }
}

fn check_file(file: &str) -> usize {
    let docs = manifests(file);
    let mut proxies = 0;
    for workload in docs
        .iter()
        .filter(|d| ["Deployment", "StatefulSet", "Job"].contains(&d["kind"].as_str().unwrap()))
    {
        let name = workload["metadata"]["name"].as_str().unwrap();
        let pod = &workload["spec"]["template"]["spec"];
        let mut volumes: HashMap<String, &Value> = pod["volumes"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|v| (v["name"].as_str().unwrap().to_owned(), v))
            .collect();
        for claim in workload["spec"]["volumeClaimTemplates"]
            .as_array()
            .into_iter()
            .flatten()
        {
            volumes.insert(
                claim["metadata"]["name"].as_str().unwrap().to_owned(),
                claim,
            );
        }
        if workload["kind"] != "Job" {
            let labels = &workload["spec"]["template"]["metadata"]["labels"];
            for (k, v) in workload["spec"]["selector"]["matchLabels"]
                .as_object()
                .unwrap()
            {
                assert_eq!(&labels[k], v, "{file}: {name} selects its own pods");
            }
        }
        for container in pod["containers"].as_array().unwrap() {
            let image = container["image"].as_str().unwrap();
            if !image.starts_with("idemproxy") {
                continue;
            }
            proxies += 1;
            let args: Vec<&str> = container["args"]
                .as_array()
                .unwrap()
                .iter()
                .map(|a| a.as_str().unwrap())
                .collect();
            // Every flag is one the command takes (flags before --help are still parsed).
            let parsed = std::process::Command::new(env!("CARGO_BIN_EXE_idemproxy"))
                .args(&args)
                .arg("--help")
                .output()
                .unwrap();
            assert!(
                parsed.status.success(),
                "{file}: {name}: {args:?}: {}",
                String::from_utf8_lossy(&parsed.stderr)
            );
            // The environment, with Secrets that exist and hold the key.
            let mut env = HashMap::new();
            for var in container["env"].as_array().into_iter().flatten() {
                let var_name = var["name"].as_str().unwrap().to_owned();
                let value = if let Some(reference) = var["valueFrom"]["secretKeyRef"].as_object() {
                    let secret = named(&docs, "Secret", reference["name"].as_str().unwrap());
                    secret["stringData"][reference["key"].as_str().unwrap()]
                        .as_str()
                        .unwrap_or_else(|| {
                            panic!("{file}: {name}: {var_name} names a key its Secret lacks")
                        })
                        .to_owned()
                } else {
                    var["value"].as_str().unwrap().to_owned()
                };
                env.insert(var_name, value);
            }
            if args.first() == Some(&"migrate") {
                assert!(
                    env.contains_key("DATABASE_URL"),
                    "{file}: {name} migrates a database it is given"
                );
            }
            let mounts: Vec<&Value> = container["volumeMounts"]
                .as_array()
                .into_iter()
                .flatten()
                .collect();
            for mount in &mounts {
                let volume = mount["name"].as_str().unwrap();
                assert!(
                    volumes.contains_key(volume),
                    "{file}: {name} mounts {volume}, which is not declared"
                );
            }
            if args.first() != Some(&"serve") {
                continue;
            }
            // The configuration, from the ConfigMap mounted where --config points.
            let config_path = args[args.iter().position(|a| *a == "--config").unwrap() + 1];
            let mount = mounts
                .iter()
                .find(|m| config_path.starts_with(m["mountPath"].as_str().unwrap()))
                .unwrap_or_else(|| panic!("{file}: {name}: {config_path} is on no volume"));
            let volume = volumes[mount["name"].as_str().unwrap()];
            let map = named(
                &docs,
                "ConfigMap",
                volume["configMap"]["name"].as_str().unwrap(),
            );
            let key = Path::new(config_path)
                .file_name()
                .unwrap()
                .to_str()
                .unwrap();
            let text = map["data"][key]
                .as_str()
                .unwrap_or_else(|| panic!("{file}: ConfigMap lacks {key}"));
            let overrides = idemproxy::config::Overrides {
                database_url: env.get("DATABASE_URL").cloned(),
                admin_token: env.get("IDEMPROXY_ADMIN_TOKEN").cloned(),
                env: Some(env.clone()),
                ..Default::default()
            };
            let config = idemproxy::config::load_str(text, &overrides)
                .unwrap_or_else(|e| panic!("{file}: {name}: the configuration is refused: {e}"));
            if let Some(format) = env.get("IDEMPROXY_LOG_FORMAT") {
                assert!(
                    ["text", "json"].contains(&format.as_str()),
                    "{file}: {format}"
                );
            }
            let ports: HashMap<String, i64> = container["ports"]
                .as_array()
                .unwrap()
                .iter()
                .map(|p| {
                    (
                        p["name"].as_str().unwrap().to_owned(),
                        p["containerPort"].as_i64().unwrap(),
                    )
                })
                .collect();
            assert_eq!(
                ports["http"],
                port_of(&config.listen),
                "{file}: the http port is `listen`'s"
            );
            assert_eq!(
                ports["admin"],
                port_of(&config.admin_listen),
                "{file}: the admin port is `admin_listen`'s"
            );
            assert!(
                !config.admin_listen.ip().is_loopback(),
                "{file}: the kubelet must reach the probes"
            );
            for (probe, path) in [("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")] {
                let get = &container[probe]["httpGet"];
                assert_eq!(get["path"], path, "{file}: {name}: {probe}");
                assert_eq!(
                    resolve(&get["port"], &ports),
                    port_of(&config.admin_listen),
                    "{file}: {probe} on the admin listener"
                );
            }
            let pre_stop = container["lifecycle"]["preStop"]["sleep"]["seconds"]
                .as_i64()
                .unwrap_or(0);
            let grace = pod["terminationGracePeriodSeconds"].as_i64().unwrap_or(30);
            let drain = i64::try_from(config.shutdown_grace.as_secs()).unwrap();
            assert!(
                grace > pre_stop + drain,
                "{file}: {name}: terminationGracePeriodSeconds {grace} must cover preStop {pre_stop} s + shutdown_grace {drain} s"
            );
            let security = &pod["securityContext"];
            assert_eq!(
                security["runAsUser"].as_i64(),
                Some(IMAGE_UID),
                "{file}: {name} runs as the image's user"
            );
            if let idemproxy::config::StoreConfig::Embedded { path, .. } = &config.store {
                let store = path.display().to_string();
                let on = mounts
                    .iter()
                    .find(|m| store.starts_with(m["mountPath"].as_str().unwrap()))
                    .unwrap_or_else(|| panic!("{file}: {name}: the embedded store {store} is on no volume: a restart would forget every key"));
                assert_ne!(
                    on["readOnly"], true,
                    "{file}: the store's volume is writable"
                );
                let volume = volumes[on["name"].as_str().unwrap()];
                assert!(
                    volume.get("configMap").is_none() && volume.get("secret").is_none(),
                    "{file}: the store is on a real volume"
                );
                assert_eq!(
                    security["fsGroup"].as_i64(),
                    Some(IMAGE_UID),
                    "{file}: the volume is writable by the image's user"
                );
                assert_eq!(
                    workload["spec"]["replicas"].as_i64(),
                    Some(1),
                    "{file}: the embedded store serves one instance"
                );
            }
            // Services and disruption budgets that select these pods reach real ports.
            let labels = &workload["spec"]["template"]["metadata"]["labels"];
            let selects = |selector: &Value| {
                selector
                    .as_object()
                    .is_some_and(|s| s.iter().all(|(k, v)| &labels[k] == v))
            };
            let mut served = false;
            for service in docs.iter().filter(|d| d["kind"] == "Service") {
                if !selects(&service["spec"]["selector"]) {
                    continue;
                }
                served = true;
                for port in service["spec"]["ports"].as_array().unwrap() {
                    let target = resolve(&port["targetPort"], &ports);
                    assert!(
                        ports.values().any(|p| *p == target),
                        "{file}: Service port {port} reaches no container port"
                    );
                }
            }
            assert!(served, "{file}: a Service selects {name}");
            for budget in docs.iter().filter(|d| d["kind"] == "PodDisruptionBudget") {
                if selects(&budget["spec"]["selector"]["matchLabels"]) {
                    let replicas = workload["spec"]["replicas"].as_i64().unwrap();
                    let min = budget["spec"]["minAvailable"].as_i64().unwrap();
                    assert!(
                        min < replicas,
                        "{file}: a budget of {min} of {replicas} would block every drain"
                    );
                }
            }
        }
    }
    proxies
}

#[test]
fn the_sidecar_manifest_agrees_with_the_binary() {
    assert_eq!(check_file("sidecar.yaml"), 1);
}

#[test]
fn the_edge_manifest_agrees_with_the_binary() {
    // The Deployment's proxy and the migration Job.
    assert_eq!(check_file("edge.yaml"), 2);
    let docs = manifests("edge.yaml");
    assert!(
        docs.iter().any(|d| d["kind"] == "PodDisruptionBudget"),
        "several replicas get a disruption budget"
    );
}
