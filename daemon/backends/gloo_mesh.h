// A Gloo context connected to every other rank with all of its pairs at
// once.
//
// gloo::rendezvous::Context::connectFullMesh (the Gloo this builds with)
// reads each lower rank's hostname key, then connects its pairs one after
// the other, a store wait and a get before each. A pair's listening side
// blocks until its peer reaches that pair in its own loop, so the nodes
// form a chain: N nodes cost about N store round trips one after the
// other (16 daemons on loopback: 0.3-0.5 s of a job's start). This does
// what connectFullMesh does, with the same store keys and the same pairs,
// but waits for every peer's keys in one store wait and connects every
// pair from a thread of its own: the listening sides wait together.
#ifndef GRADSYNC_DAEMON_BACKENDS_GLOO_MESH_H_
#define GRADSYNC_DAEMON_BACKENDS_GLOO_MESH_H_

#include <memory>

#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/store.h"
#include "gloo/transport/device.h"

namespace gradsync {

class MeshContext final : public gloo::rendezvous::Context {
 public:
  using gloo::rendezvous::Context::Context;

  // Throws what connectFullMesh throws (the store's errors, gloo::IoException
  // for a pair that did not connect within the context's timeout); the first
  // pair's failure when several fail.
  void ConnectAllPairs(gloo::rendezvous::Store& store,
                       const std::shared_ptr<gloo::transport::Device>& device);
};

}  // namespace gradsync

#endif  // GRADSYNC_DAEMON_BACKENDS_GLOO_MESH_H_
