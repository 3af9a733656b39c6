// A client of ratelimitd's gRPC face, generated at run time from Envoy's own
// rls.proto (the copy of data-plane-api that @grpc/grpc-js-xds ships under
// deps/envoy-api/), never from ratelimitd's proto/ files.
//
//   node scenario.cjs health PORT [SERVICE]   prints SERVING (or ERROR <code>)
//   node scenario.cjs watch PORT PID   Health/Watch: prints each status as it
//                                      comes, sends SIGTERM to PID after the
//                                      first, and prints END <code> when the
//                                      stream ends
//   node scenario.cjs scenario PORT    envoyproxy/ratelimit's integration
//                                      scenario on basic.yaml/another.yaml;
//                                      prints PASS, or the failures and exits 1
//   node scenario.cjs call PORT JSON   one ShouldRateLimit, prints the answer
//                                      (or {"error": code}) as JSON
'use strict';
const path = require('path');
const grpc = require('@grpc/grpc-js');
const loader = require('@grpc/proto-loader');

const deps = path.join(path.dirname(require.resolve('@grpc/grpc-js-xds/package.json')), 'deps');
const opts = {
  keepCase: true, longs: Number, enums: String, defaults: true, oneofs: true,
  includeDirs: ['envoy-api', 'xds', 'googleapis', 'protoc-gen-validate'].map((d) => path.join(deps, d)),
};
const rls = grpc.loadPackageDefinition(loader.loadSync('envoy/service/ratelimit/v3/rls.proto', opts));
const health = grpc.loadPackageDefinition(loader.loadSync(path.join(__dirname, 'health.proto'), opts));

const [cmd, port, arg] = process.argv.slice(2);
const target = `127.0.0.1:${port}`;
const client = new rls.envoy.service.ratelimit.v3.RateLimitService(target, grpc.credentials.createInsecure());

function call(req) {
  return new Promise((resolve) => {
    const deadline = new Date(Date.now() + 5000);
    client.ShouldRateLimit(req, { deadline }, (err, resp) => resolve(err ? { error: grpc.status[err.code] } : resp));
  });
}
const req = (domain, ...descs) => ({ domain, hits_addend: 1, descriptors: descs.map((entries) => ({ entries })) });
const failures = [];
function expect(cond, what, got) {
  if (!cond) failures.push(`${what}: got ${JSON.stringify(got)}`);
}
const seconds = (d) => (d ? Number(d.seconds) + d.nanos / 1e9 : -1);

async function scenario() {
  const rnd = `${process.pid}-${Date.now()}`;
  // An unknown domain: OK, no limit.
  let r = await call(req('foo', [{ key: 'hello', value: 'world' }]));
  expect(r.overall_code === 'OK' && r.statuses.length === 1 && r.statuses[0].code === 'OK' &&
         r.statuses[0].current_limit === null && r.statuses[0].limit_remaining === 0, 'unknown domain', r);
  // basic: key1 50/second.
  r = await call(req('basic', [{ key: 'key1', value: 'foo' + rnd }]));
  const s = r.statuses && r.statuses[0];
  expect(r.overall_code === 'OK' && s.current_limit && s.current_limit.requests_per_unit === 50 &&
         s.current_limit.unit === 'SECOND' && s.limit_remaining === 49 &&
         seconds(s.duration_until_reset) > 0 && seconds(s.duration_until_reset) <= 1, 'basic key1', r);
  // another: 25 calls on key2 (20/minute).
  for (let i = 0; i < 25; i++) {
    r = await call(req('another', [{ key: 'key2', value: 'a' + rnd }]));
    const over = i >= 20;
    const st = r.statuses && r.statuses[0];
    expect(r.overall_code === (over ? 'OVER_LIMIT' : 'OK') && st.code === r.overall_code &&
           st.current_limit.requests_per_unit === 20 && st.current_limit.unit === 'MINUTE' &&
           st.limit_remaining === (over ? 0 : 19 - i) &&
           seconds(st.duration_until_reset) > 0 && seconds(st.duration_until_reset) <= 60, `key2 call ${i + 1}`, r);
  }
  // key2 and key3 (10/hour) together: the 11th call is over the limit on key3.
  for (let i = 0; i < 15; i++) {
    r = await call(req('another', [{ key: 'key2', value: 'b' + rnd }], [{ key: 'key3', value: 'b' + rnd }]));
    const over = i >= 10;
    const [a, b] = r.statuses || [];
    expect(r.overall_code === (over ? 'OVER_LIMIT' : 'OK') && a.code === 'OK' &&
           a.current_limit.requests_per_unit === 20 && a.current_limit.unit === 'MINUTE' &&
           // All or nothing (their STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT): key2 stays at 10.
           a.limit_remaining === (over ? 10 : 19 - i) &&
           b.code === (over ? 'OVER_LIMIT' : 'OK') && b.current_limit.requests_per_unit === 10 &&
           b.current_limit.unit === 'HOUR' && b.limit_remaining === (over ? 0 : 9 - i), `key2+key3 call ${i + 1}`, r);
  }
  // duration_until_reset counts down between two calls 2 s apart (key4: 20/day).
  const r1 = await call(req('another', [{ key: 'key4', value: 'durTest' + rnd }]));
  await new Promise((res) => setTimeout(res, 2000));
  const r2 = await call(req('another', [{ key: 'key4', value: 'durTest' + rnd }]));
  const d1 = seconds(r1.statuses[0].duration_until_reset), d2 = seconds(r2.statuses[0].duration_until_reset);
  expect(Math.floor(d2) < Math.floor(d1) && d1 - d2 > 1.5 && d1 - d2 < 3, 'duration_until_reset counts down', [d1, d2]);
  expect(r2.statuses[0].limit_remaining === 18, 'key4 remaining', r2);
  if (failures.length) {
    console.log(failures.join('\n'));
    process.exit(1);
  }
  console.log('PASS');
}

async function main() {
  if (cmd === 'health') {
    const h = new health.grpc.health.v1.Health(target, grpc.credentials.createInsecure());
    h.Check({ service: arg || '' }, { deadline: new Date(Date.now() + 5000) }, (err, resp) => {
      console.log(err ? `ERROR ${grpc.status[err.code]}` : resp.status);
      process.exit(0);
    });
    return;
  }
  if (cmd === 'watch') {
    const h = new health.grpc.health.v1.Health(target, grpc.credentials.createInsecure());
    const stream = h.Watch({ service: '' }, { deadline: new Date(Date.now() + 10000) });
    let first = true;
    stream.on('data', (resp) => {
      console.log(resp.status);
      if (first) process.kill(Number(arg), 'SIGTERM');
      first = false;
    });
    stream.on('status', (s) => {
      console.log(`END ${grpc.status[s.code]}`);
      process.exit(0);
    });
    stream.on('error', () => {});  // the status event reports it
    return;
  }
  if (cmd === 'scenario') await scenario();
  else if (cmd === 'call') console.log(JSON.stringify(await call(JSON.parse(arg))));
  else throw new Error(`unknown command ${cmd}`);
  process.exit(0);
}
main().catch((e) => { console.log(String(e && e.stack || e)); process.exit(1); });
