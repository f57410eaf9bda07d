// What the process group tells the store it was made with, without the
// store's (Asio) headers.
#ifndef BACKPLANE_CORE_DISTRIBUTED_STORE_LINGER_HPP_
#define BACKPLANE_CORE_DISTRIBUTED_STORE_LINGER_HPP_

#include <backplane/rendezvous.hpp>

namespace backplane::store_detail {

// This process's rank failed a collective: if `store` hosts the job's TCP
// store, it keeps serving the ranks still connected when it is destroyed, so
// that they can read the failure board (Server::linger_on_close). Any other
// store: nothing.
void linger_on_close(Store& store) noexcept;

}  // namespace backplane::store_detail

#endif  // BACKPLANE_CORE_DISTRIBUTED_STORE_LINGER_HPP_
