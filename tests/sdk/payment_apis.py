"""The official Python SDKs of Adyen, PayPal, Checkout.com and Square against idemproxy in
front of a provider speaking that API's create-payment endpoint, with the API's error
preset. Driven by tests/it/sdk_apis.rs, which starts the proxies and the provider and
checks the provider's executions; this script checks what the SDK makes of each answer.

Environment: API (adyen, paypal, checkout, square); PROXY (the proxy, `on_conflict:
reject`), PROXY_WAIT (the same with `on_conflict: {wait}`), PROXY_DOWN (its store is
unreachable); TENANT_A1, TENANT_A2 (two credentials of one tenant), TENANT_B (another
tenant's; for PayPal the tenant a gateway would set, unless ONE_MERCHANT is set). Prints one JSON line: per scenario, {"ok": the payment's id} or {"error": what
the SDK raised: its class, status, and the API's own code and category}."""

import json
import os
import threading
import time

API = os.environ["API"]
PID = os.getpid()
RUN = f"{PID}-{int(time.time() * 1000)}"


def base(which="PROXY"):
    return "http://" + os.environ[which]


# --- Adyen: X-API-Key, Idempotency-Key, errors as AdyenAPI*Error with error_code. ---

def adyen_pay(proxy, credential, key, amount, note):
    import Adyen

    adyen = Adyen.Adyen(xapikey=credential, platform="test")
    # The SDK's hosts are fixed; its service's base URL is where a proxy goes in.
    adyen.checkout.payments_api.baseUrl = proxy + "/v72"
    request = {
        "amount": {"value": amount, "currency": "EUR"},
        "reference": note,
        "paymentMethod": {"type": "scheme", "encryptedCardNumber": "test_4111111111111111"},
        "returnUrl": "https://shop.example/return",
        "merchantAccount": "ShopECOM",
    }
    kwargs = {"idempotency_key": key} if key is not None else {}
    result = adyen.checkout.payments_api.payments(request, **kwargs)
    return result.message["pspReference"]


def adyen_error(e):
    import Adyen

    if not isinstance(e, Adyen.AdyenError):
        return None
    message = e.message if isinstance(e.message, dict) else {}
    return {
        "class": type(e).__name__,
        "status": e.status_code,
        "code": e.error_code,
        "category": message.get("errorType"),
        "transient": (e.headers or {}).get("transient-error"),
    }


# --- PayPal: OAuth tokens per SDK instance, PayPal-Request-Id, ErrorException. ---

class Tenant:
    """Stands in for the gateway in front of the proxy: it sets the tenant it
    authenticated (X-Tenant) on every request."""

    def __init__(self, tenant):
        from apimatic_core.http.http_callback import HttpCallBack

        class CallBack(HttpCallBack):
            def on_before_request(self, request):
                request.headers["X-Tenant"] = tenant

            def on_after_response(self, http_response):
                pass

        self.callback = CallBack()


def paypal_pay(proxy, credential, key, amount, note):
    from paypalserversdk.configuration import Configuration, Environment, Server
    from paypalserversdk.http.auth.o_auth_2 import ClientCredentialsAuthCredentials
    from paypalserversdk.models.amount_with_breakdown import AmountWithBreakdown
    from paypalserversdk.models.checkout_payment_intent import CheckoutPaymentIntent
    from paypalserversdk.models.order_request import OrderRequest
    from paypalserversdk.models.purchase_unit_request import PurchaseUnitRequest
    from paypalserversdk.paypal_serversdk_client import PaypalServersdkClient

    # The SDK's hosts are a fixed table; the sandbox's entry is where a proxy goes in.
    Configuration.environments[Environment.SANDBOX][Server.DEFAULT] = proxy
    # A new SDK instance: it fetches an OAuth token of its own (a renewal does the same).
    client = PaypalServersdkClient(
        client_credentials_auth_credentials=ClientCredentialsAuthCredentials(
            o_auth_client_id="AYSq3RDGsmBLJE-otTkBtM", o_auth_client_secret="EGnHDxD_qRPdaLdZz8iCr8N7"
        ),
        environment=Environment.SANDBOX,
        # Without a gateway (one merchant, `client_id: static`) the SDK is used as it comes.
        http_call_back=None if os.environ.get("ONE_MERCHANT") else Tenant(credential).callback,
    )
    body = OrderRequest(
        intent=CheckoutPaymentIntent.CAPTURE,
        purchase_units=[
            PurchaseUnitRequest(
                amount=AmountWithBreakdown(currency_code="USD", value=f"{amount / 100:.2f}"),
                reference_id=note,
            )
        ],
    )
    options = {"body": body}
    if key is not None:
        options["paypal_request_id"] = key
    return client.orders.create_order(options).body.id


def paypal_error(e):
    from paypalserversdk.exceptions.api_exception import ApiException
    from paypalserversdk.exceptions.error_exception import ErrorException

    if isinstance(e, ErrorException):
        details = e.details or []
        return {
            "class": type(e).__name__,
            "status": e.response_code,
            "code": details[0].issue if details else None,
            "category": e.name,
        }
    if isinstance(e, ApiException):
        return {"class": type(e).__name__, "status": e.response_code, "code": None, "category": None}
    return None


# --- Checkout.com: secret key, Cko-Idempotency-Key, CheckoutApiException. ---

def checkout_pay(proxy, credential, key, amount, note):
    from checkout_sdk.checkout_sdk import CheckoutSdk
    from checkout_sdk.common.enums import Currency
    from checkout_sdk.environment import Environment
    from checkout_sdk.payments.payments import PaymentRequest, PaymentRequestCardSource

    env = Environment(
        base_uri=proxy + "/",
        authorization_uri=proxy + "/connect/token",
        files_uri=proxy + "/",
        transfers_uri=proxy + "/",
        balances_uri=proxy + "/",
        forward_uri=proxy + "/",
        identity_uri=proxy + "/",
        is_sandbox=True,
    )
    # The proxy is the SDK's host: its merchant-specific subdomain (which the SDK would put
    # in front of the proxy's host name) belongs in the proxy's upstream URL instead.
    api = CheckoutSdk.builder().secret_key(credential).environment(env).use_legacy_domain().build()
    source = PaymentRequestCardSource()
    source.number = "4242424242424242"
    source.expiry_month = 12
    source.expiry_year = 2030
    request = PaymentRequest()
    request.source = source
    request.amount = amount
    request.currency = Currency.USD
    request.reference = note
    return api.payments.request_payment(request, key).id


def checkout_error(e):
    from checkout_sdk.exception import CheckoutApiException

    if not isinstance(e, CheckoutApiException):
        return None
    codes = e.error_details or []
    return {
        "class": type(e).__name__,
        "status": e.http_metadata.status_code,
        "code": codes[0] if codes else None,
        "category": e.error_type,
    }


# --- Square: access token, idempotency_key in the body, ApiError; retries 409 and 5xx. ---

def square_pay(proxy, credential, key, amount, note):
    from square import Square

    client = Square(token=credential, base_url=proxy)
    response = client.payments.create(
        source_id="cnon:card-nonce-ok",
        # A missing key is left out of the body (the SDK requires the argument).
        idempotency_key=key if key is not None else None,
        amount_money={"amount": amount, "currency": "USD"},
        note=note,
    )
    return response.payment.id


def square_error(e):
    from square.core.api_error import ApiError

    if not isinstance(e, ApiError):
        return None
    errors = e.errors or []
    return {
        "class": type(e).__name__,
        "status": e.status_code,
        "code": errors[0].code if errors else None,
        "category": errors[0].category if errors else None,
    }


PAY = {"adyen": adyen_pay, "paypal": paypal_pay, "checkout": checkout_pay, "square": square_pay}[API]
ERROR = {"adyen": adyen_error, "paypal": paypal_error, "checkout": checkout_error, "square": square_error}[API]
# The longest key the API takes (Checkout.com states none; 255 is the proxy's own limit).
LONGEST = {"adyen": 64, "paypal": 108, "checkout": 255, "square": 45}[API]

A1, A2, B = os.environ["TENANT_A1"], os.environ["TENANT_A2"], os.environ["TENANT_B"]


def attempt(key, amount=100, note="order", proxy=None, credential=None):
    """One SDK call: {"ok": id} or {"error": …}; anything else the SDK raises fails the run."""
    try:
        return {"ok": PAY(proxy or base(), credential or A1, key, amount, note)}
    except Exception as e:  # noqa: BLE001 - sorted by the SDK's own classes below
        error = ERROR(e)
        if error is None:
            raise
        return {"error": error}


def together(first, second):
    """`first` starts; `second` starts while the first is in flight."""
    out = {}

    def run(name, call):
        out[name] = call()

    t = threading.Thread(target=run, args=("first", first))
    t.start()
    time.sleep(0.4)
    run("second", second)
    t.join()
    return out


results = {}
key = f"create-{RUN}"
results["create"] = attempt(key)
results["replay"] = attempt(key)
results["reused"] = attempt(key, amount=999)

busy = f"busy-{RUN}"
results["in_flight"] = together(lambda: attempt(busy, note="slow"), lambda: attempt(busy, note="slow"))
waited = f"waited-{RUN}"
wait = base("PROXY_WAIT")
results["in_flight_wait"] = together(
    lambda: attempt(waited, note="slow", proxy=wait), lambda: attempt(waited, note="slow", proxy=wait)
)

failed = f"failed-{RUN}"
results["stored_5xx"] = [attempt(failed, note="fail"), attempt(failed, note="fail")]
results["store_down"] = attempt(f"down-{RUN}", proxy=base("PROXY_DOWN"))
results["missing_key"] = attempt(None)

longest = (f"long-{RUN}-" + "k" * LONGEST)[:LONGEST]
results["longest_key"] = attempt(longest)
results["longest_key_length"] = len(longest)

shared = f"tenant-{RUN}"
results["tenants"] = {
    "a1": attempt(shared, credential=A1),
    "a2": attempt(shared, credential=A2),
    "b": attempt(shared, credential=B),
}

print(json.dumps(results))
