// stripe-node (the official SDK, with its automatic retries) against a Stripe-shaped
// upstream behind idemproxy with `errors: stripe`. Driven by tests/it/sdk_stripe.rs, which
// starts the proxy and the upstream and checks the upstream's charge counts; this script
// checks what the SDK makes of each answer. Prints one JSON line of results.
import Stripe from 'stripe';

const [host, port] = process.env.PROXY.split(':');
const client = (options = {}) => {
  const stripe = new Stripe('sk_test_idemproxy', {
    host, port: Number(port), protocol: 'http',
    maxNetworkRetries: 4, ...options,
  });
  const seen = [];
  stripe.on('response', (r) => seen.push(r.status));
  return { stripe, seen };
};
const results = {};
const fail = (why) => { console.error(why); process.exit(1); };

// A timeout retried with the SDK's own key: one charge, the first answer.
{
  const { stripe, seen } = client({ timeout: 300 });
  const charge = await stripe.charges.create({ amount: 100, currency: 'usd', description: 'slow' });
  results.timeout = { charge, statuses: seen };
}
// Concurrent calls, each its own key: each charged once.
{
  const { stripe } = client();
  const charges = await Promise.all([1, 2, 3, 4, 5].map((i) =>
    stripe.charges.create({ amount: 100 + i, currency: 'usd' })));
  results.concurrent = charges.map((c) => c.charge_id);
}
// The same key with another amount: the SDK's idempotency error, not a success.
{
  const { stripe } = client();
  const key = `reuse-${process.pid}`;
  await stripe.charges.create({ amount: 100, currency: 'usd' }, { idempotencyKey: key });
  try {
    const c = await stripe.charges.create({ amount: 999, currency: 'usd' }, { idempotencyKey: key });
    fail(`a reused key was taken for a success: ${JSON.stringify(c)}`);
  } catch (e) {
    results.reused = { class: e.constructor.name, type: e.type, code: e.code, status: e.statusCode };
  }
}
// A key in progress: the second call is retried by the SDK and ends in the first answer.
{
  const { stripe, seen } = client();
  const key = `busy-${process.pid}`;
  const first = stripe.charges.create({ amount: 100, currency: 'usd', description: 'slow' }, { idempotencyKey: key });
  await new Promise((r) => setTimeout(r, 150));
  const second = await stripe.charges.create({ amount: 100, currency: 'usd', description: 'slow' }, { idempotencyKey: key });
  results.in_progress = { first: await first, second, statuses: seen };
}
// A 410 (the answer was too large to store) stops the SDK's retries.
{
  const { stripe, seen } = client();
  const key = `gone-${process.pid}`;
  await stripe.rawRequest('POST', '/v1/big', { amount: 1 }, { idempotencyKey: key });
  const before = seen.length;
  try {
    await stripe.rawRequest('POST', '/v1/big', { amount: 1 }, { idempotencyKey: key });
    fail('a 410 was taken for a success');
  } catch (e) {
    results.gone = { class: e.constructor.name, status: e.statusCode, requests: seen.length - before };
  }
}
console.log(JSON.stringify(results));
