#include "daemon/backends/gloo_mesh.h"

#include <limits.h>
#include <unistd.h>

#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "gloo/transport/address.h"
#include "gloo/transport/context.h"
#include "gloo/transport/pair.h"

namespace gradsync {
namespace {

// The keys connectFullMesh uses: a rank's hostname, and its pairs' addresses.
std::string HostKey(int rank) { return "rank_" + std::to_string(rank); }
std::string AddressesKey(int rank) { return std::to_string(rank); }

std::string LocalHostName() {
  char name[HOST_NAME_MAX + 1] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return "";
  return std::string(name);
}

}  // namespace

void MeshContext::ConnectAllPairs(gloo::rendezvous::Store& store,
                                  const std::shared_ptr<gloo::transport::Device>& device) {
  const std::string host = LocalHostName();
  store.set(HostKey(rank), std::vector<char>(host.begin(), host.end()));

  std::shared_ptr<gloo::transport::Context> transport = device->createContext(rank, size);
  transport->setTimeout(getTimeout());
  std::vector<char> addresses;
  for (int i = 0; i < size; ++i) {
    if (i == rank) continue;
    const std::vector<char> bytes = transport->createPair(i)->address().bytes();
    addresses.insert(addresses.end(), bytes.begin(), bytes.end());
  }
  store.set(AddressesKey(rank), addresses);

  // One wait for every record this rank reads (each is written before its
  // writer connects anything, so none waits on a connect).
  std::vector<std::string> keys;
  for (int i = 0; i < size; ++i) {
    if (i == rank) continue;
    if (i < rank) keys.push_back(HostKey(i));
    keys.push_back(AddressesKey(i));
  }
  store.wait(keys, getTimeout());
  // The node-local rank, as connectFullMesh computes it: the lower ranks on
  // this host.
  int local_rank = 0;
  for (int i = 0; i < rank; ++i) {
    if (std::vector<char> theirs = store.get(HostKey(i));
        std::string(theirs.begin(), theirs.end()) == host) {
      ++local_rank;
    }
  }
  std::vector<std::vector<char>> peer_address(size);
  for (int i = 0; i < size; ++i) {
    if (i == rank) continue;
    std::vector<char> all = store.get(AddressesKey(i));
    peer_address[i] = extractAddress(all, i);
    transport->getPair(i)->setLocalRank(local_rank);
  }

  std::mutex mu;
  std::exception_ptr first_failure;
  std::vector<std::thread> connecting;
  for (int i = 0; i < size; ++i) {
    if (i == rank) continue;
    connecting.emplace_back([&, i] {
      try {
        transport->getPair(i)->connect(peer_address[i]);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu);
        if (!first_failure) first_failure = std::current_exception();
      }
    });
  }
  for (std::thread& t : connecting) t.join();
  if (first_failure) std::rethrow_exception(first_failure);

  device_ = device;
  transportContext_ = std::move(transport);
}

}  // namespace gradsync
