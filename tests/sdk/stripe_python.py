"""stripe-python (the official SDK, with its automatic retries) against a Stripe-shaped
upstream behind idemproxy with `errors: stripe`. Driven by tests/it/sdk_stripe.rs, which
starts the proxy and the upstream and checks the upstream's charge counts; this script
checks what the SDK makes of each answer. Prints one JSON line of results."""

import json
import os
import sys
import threading
import time

import stripe

PROXY = "http://" + os.environ["PROXY"]
statuses = []


class Counting(stripe.RequestsClient):
    """The SDK's own HTTP client, counting the answers it gets."""

    def request(self, method, url, headers, post_data=None):
        body, status, headers = super().request(method, url, headers, post_data)
        statuses.append(status)
        return body, status, headers


def client(timeout=80):
    return stripe.StripeClient(
        "sk_test_idemproxy",
        base_addresses={"api": PROXY},
        max_network_retries=4,
        http_client=Counting(timeout=timeout),
    )


def charge(c, amount, key=None, description=None):
    params = {"amount": amount, "currency": "usd"}
    if description:
        params["description"] = description
    options = {"idempotency_key": key} if key else {}
    return c.v1.charges.create(params=params, options=options)


results = {}
pid = os.getpid()

# A timeout retried with the SDK's own key: one charge, the first answer.
statuses.clear()
first = charge(client(timeout=0.3), 100, description="slow")
results["timeout"] = {"charge": first.to_dict(), "statuses": list(statuses)}

# Concurrent calls, each its own key: each charged once.
out = [None] * 5
def pay(i):
    out[i] = charge(client(), 100 + i).to_dict()["charge_id"]
threads = [threading.Thread(target=pay, args=(i,)) for i in range(5)]
for t in threads:
    t.start()
for t in threads:
    t.join()
results["concurrent"] = out

# The same key with another amount: the SDK's idempotency error, not a success.
c = client()
charge(c, 100, key=f"reuse-{pid}")
try:
    other = charge(c, 999, key=f"reuse-{pid}")
    sys.exit(f"a reused key was taken for a success: {other}")
except stripe.IdempotencyError as e:
    results["reused"] = {"class": type(e).__name__, "status": e.http_status, "code": e.code}
except stripe.StripeError as e:
    sys.exit(f"a reused key raised {type(e).__name__}, not IdempotencyError: {e}")

# A key in progress: the second call is retried by the SDK and ends in the first answer.
statuses.clear()
answers = {}
def slow(name):
    answers[name] = charge(client(), 100, key=f"busy-{pid}", description="slow").to_dict()
t = threading.Thread(target=slow, args=("first",))
t.start()
time.sleep(0.15)
slow("second")
t.join()
results["in_progress"] = {"first": answers["first"], "second": answers["second"], "statuses": list(statuses)}

# A 410 (the answer was too large to store) stops the SDK's retries.
c = client()
c.raw_request("post", "/v1/big", amount=1, idempotency_key=f"gone-{pid}")
statuses.clear()
try:
    # raw_request hands back what it got, without raising: its status is the check.
    resp = c.raw_request("post", "/v1/big", amount=1, idempotency_key=f"gone-{pid}")
    results["gone"] = {"class": None, "status": resp.code, "requests": len(statuses)}
except stripe.StripeError as e:
    results["gone"] = {"class": type(e).__name__, "status": e.http_status, "requests": len(statuses)}

print(json.dumps(results))
