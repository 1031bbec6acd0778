// The official JavaScript client (@kubernetes/client-node) against the server in KUBECONFIG:
// create, read, read-modify-replace, list, watch and delete ConfigMaps, as an application would.
// Prints one line per step; exits non-zero at the first step that fails.
import * as k8s from '@kubernetes/client-node';

const kc = new k8s.KubeConfig();
kc.loadFromDefault();
const core = kc.makeApiClient(k8s.CoreV1Api);
const namespace = 'default';

function step(name) {
  console.log(`ok ${name}`);
}

async function main() {
  const created = await core.createNamespacedConfigMap({
    namespace,
    body: { metadata: { name: 'js-peer' }, data: { color: 'red' } },
  });
  if (created.metadata?.uid === undefined) throw new Error('create gave no uid');
  step('create');

  // Read, change, replace: the client sends the creation time back with milliseconds.
  const read = await core.readNamespacedConfigMap({ name: 'js-peer', namespace });
  read.data = { ...read.data, color: 'blue' };
  const replaced = await core.replaceNamespacedConfigMap({ name: 'js-peer', namespace, body: read });
  if (replaced.data?.color !== 'blue') throw new Error(`replace kept ${JSON.stringify(replaced.data)}`);
  if (replaced.metadata?.resourceVersion === read.metadata?.resourceVersion) {
    throw new Error('replace did not change the resourceVersion');
  }
  step('read-modify-replace');

  const list = await core.listNamespacedConfigMap({ namespace });
  if (!list.items.some((c) => c.metadata?.name === 'js-peer')) throw new Error('list misses js-peer');
  step('list');

  // A watch from the list's resourceVersion sees a new ConfigMap.
  const seen = new Promise((resolve, reject) => {
    const watch = new k8s.Watch(kc);
    const timer = setTimeout(() => reject(new Error('no ADDED event within 10 s')), 10000);
    watch
      .watch(
        `/api/v1/namespaces/${namespace}/configmaps`,
        { resourceVersion: list.metadata?.resourceVersion },
        (type, obj) => {
          if (type === 'ADDED' && obj.metadata?.name === 'js-peer-2') {
            clearTimeout(timer);
            resolve(null);
          }
        },
        (err) => {
          if (err) reject(err);
        },
      )
      .then((req) => seen.finally(() => req.abort()))
      .catch(reject);
  });
  await core.createNamespacedConfigMap({
    namespace,
    body: { metadata: { name: 'js-peer-2' }, data: { color: 'green' } },
  });
  await seen;
  step('watch');

  // A refusal comes back as the server's Status.
  try {
    await core.createNamespacedConfigMap({ namespace, body: { metadata: { name: 'Not_Valid' } } });
    throw new Error('an invalid name was accepted');
  } catch (e) {
    if (e.code !== 422) throw e;
  }
  step('invalid');

  await core.deleteNamespacedConfigMap({ name: 'js-peer', namespace });
  await core.deleteNamespacedConfigMap({ name: 'js-peer-2', namespace });
  step('delete');
}

main().then(
  () => process.exit(0),
  (e) => {
    console.error(`failed: ${e?.stack ?? e}`);
    process.exit(1);
  },
);
