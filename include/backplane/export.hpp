// BACKPLANE_API marks what libbackplane exports; everything else is hidden.
#ifndef BACKPLANE_EXPORT_HPP_
#define BACKPLANE_EXPORT_HPP_

#if defined(BACKPLANE_BUILDING_CORE)
#define BACKPLANE_API __attribute__((visibility("default")))
#else
#define BACKPLANE_API
#endif

#endif  // BACKPLANE_EXPORT_HPP_
