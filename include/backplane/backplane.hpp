// The umbrella header of backplane's host-application API.
#ifndef BACKPLANE_BACKPLANE_HPP_
#define BACKPLANE_BACKPLANE_HPP_

#include <backplane/autograd.hpp>
#include <backplane/capability.hpp>
#include <backplane/distributed.hpp>
#include <backplane/dlpack.hpp>
#include <backplane/dtype.hpp>
#include <backplane/error.hpp>
#include <backplane/log.hpp>
#include <backplane/nn.hpp>
#include <backplane/ops.hpp>
#include <backplane/process_group.hpp>
#include <backplane/registry.hpp>
#include <backplane/rendezvous.hpp>
#include <backplane/requirements.hpp>
#include <backplane/safetensors.hpp>
#include <backplane/shape.hpp>
#include <backplane/tensor.hpp>
#include <backplane/trace.hpp>
#include <backplane/version.hpp>

#endif  // BACKPLANE_BACKPLANE_HPP_
